"""Process infrastructure shared by the apps: the io loop, circuit breakers,
fault points and cancellation signals. Imports nothing from the apps."""
