"""The CLI's sizes and hand-overs: a quick run must be able to run every benchmark."""

from django.conf import settings

from bench import cli, fanout


def test_processes_are_handed_on_only_between_neighbours() -> None:
    # A process kept for a benchmark that does not run next would be stopped unused.
    for name, kept in cli.SHARED.items():
        assert name in cli.BENCHMARKS
        neighbours = [
            cli.BENCHMARKS[i]
            for i in (cli.BENCHMARKS.index(name) - 1, cli.BENCHMARKS.index(name) + 1)
            if 0 <= i < len(cli.BENCHMARKS)
        ]
        assert any(kept & cli.SHARED.get(other, set()) for other in neighbours), name


def test_quick_says_what_it_leaves_out_of_known_benchmarks() -> None:
    assert set(cli.QUICK_LEAVES_OUT) <= set(cli.BENCHMARKS)
    # Series quick drops entirely are among them.
    assert cli.QUICK.recovery_standby_kills == 0 and "recovery" in cli.QUICK_LEAVES_OUT
    assert cli.QUICK.http_layouts != cli.FULL.http_layouts and "http" in cli.QUICK_LEAVES_OUT


def test_quick_sizes_fit_the_benchmarks() -> None:
    for sizes in (cli.QUICK, cli.FULL):
        # Every client process holds the same share of each session's watchers.
        assert sizes.fanout_watchers % fanout.CLIENTS == 0
        large = sizes.memory_large_items or max(
            sizes.memory_items // 20, 2 * settings.MEMORY_EXACT_SCAN_MAX
        )
        # Large owners get their own index (above the exact scan) and leave items to the rest.
        assert large > settings.MEMORY_EXACT_SCAN_MAX
        assert sizes.memory_large_owners * large < sizes.memory_items
