import io
import json
import logging

from observability.logs import JsonFormatter, ScrubbingFormatter, bound

SECRET = "sk-test-abcdefghijklmnop0123"


def _logger(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.observability.{id(stream)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_a_line_is_one_json_object_with_the_bound_ids() -> None:
    logger, stream = _logger(JsonFormatter())
    with bound(session="s-1", turn=2, step=7):
        logger.info("step ran: %s calls", 3)
    logger.info("outside")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "step ran: 3 calls"
    assert (first["session"], first["turn"], first["step"]) == ("s-1", 2, 7)
    assert first["level"] == "info" and first["logger"].startswith("test.observability")
    assert "ts" in first
    assert "session" not in second  # unbound when the block ends


def test_messages_and_exceptions_are_scrubbed() -> None:
    logger, stream = _logger(JsonFormatter())
    try:
        raise RuntimeError(f"provider said: bad key {SECRET} for bob@example.com")
    except RuntimeError:
        logger.exception("call failed for %s", "alice@example.com")
    text = stream.getvalue()
    line = json.loads(text)
    assert SECRET not in text and "bob@example.com" not in text and "alice@example.com" not in text
    assert "[redacted:key]" in line["exception"] and "[redacted:email]" in line["event"]


def test_the_plain_format_is_scrubbed_too() -> None:
    logger, stream = _logger(ScrubbingFormatter("%(levelname)s %(message)s"))
    logger.warning("card 4111 1111 1111 1111 from carol@example.com")
    assert stream.getvalue().strip() == "WARNING card [redacted:card] from [redacted:email]"


def test_extra_fields_become_keys() -> None:
    logger, stream = _logger(JsonFormatter())
    logger.info("GET /x 200", extra={"client": "127.0.0.1:5", "status": 200})
    line = json.loads(stream.getvalue())
    assert (line["client"], line["status"]) == ("127.0.0.1:5", 200)


class _Request:
    def __repr__(self) -> str:
        return "<ASGIRequest: GET '/api/v1/sessions/?token=ap_abcdefghijklmnopqrst'>"


def test_objects_in_a_line_are_scrubbed_as_text() -> None:
    logger, stream = _logger(JsonFormatter())
    logger.warning(
        "Unauthorized: %s", _Request(), extra={"request": _Request(), "status_code": 401}
    )
    text = stream.getvalue()
    assert "ap_abcdefghijklmnopqrst" not in text
    line = json.loads(text)
    assert line["status_code"] == 401 and "request" not in line
