"""The cost page's SVG (billing/charts.py): stacked columns, axes, legend, total."""

import re
from datetime import date, timedelta
from decimal import Decimal

from billing.charts import amount, nice_ticks, spend_chart
from billing.series import Series, SpendSeries

DAY = date(2026, 3, 1)


def _data(*series: tuple[str, list[int]]) -> SpendSeries:
    days = len(series[0][1]) if series else 7
    return SpendSeries(
        stack="model",
        days=[DAY + timedelta(days=i) for i in range(days)],
        series=[Series(label, [Decimal(v) for v in values]) for label, values in series],
    )


def test_nice_ticks_cover_the_top_in_round_steps() -> None:
    assert nice_ticks(9.3) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.037) == [0, 0.01, 0.02, 0.03, 0.04]
    assert nice_ticks(0) == [0, 1]
    assert amount(Decimal("0.0030")) == "0.003" and amount(1234.5) == "1,234"


def test_each_series_is_a_group_of_columns_stacked_per_day() -> None:
    svg = str(spend_chart(_data(("gpt", [1, 0, 3]), ("rules", [1, 2, 0]))))

    groups = dict(re.findall(r'data-series="([^"]+)">(.*?)</g>', svg))
    assert set(groups) == {"gpt", "rules"}
    # A zero day draws no column, so gpt has 2 and rules 2.
    assert groups["gpt"].count("<rect") == 2 and groups["rules"].count("<rect") == 2
    # On day 1 rules sits on top of gpt: its column ends where gpt's starts.
    gpt_y, gpt_h = (
        float(v)
        for v in re.findall(r'y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', groups["gpt"])[0]
    )
    rules_y, rules_h = (
        float(v)
        for v in re.findall(r'y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', groups["rules"])[0]
    )
    assert abs(rules_y + rules_h - gpt_y) < 0.2 and abs(rules_h - gpt_h) < 0.2


def test_axes_legend_and_total_are_drawn_and_it_scales_to_the_page() -> None:
    svg = str(spend_chart(_data(("gpt", [1, 0, 3]), ("rules", [1, 2, 0]))))

    assert 'width="100%"' in svg and 'viewBox="0 0 1300 ' in svg
    assert ">Mar 01<" not in svg  # 3 days: day names
    assert ">Sun Mar 01<" in svg and ">Tue Mar 03<" in svg
    amounts = re.findall(r'class="y-label"[^>]*>([^<]+)<', svg)
    assert amounts == ["0", "1", "2", "3"]
    assert ">gpt 4.00<" in svg and ">rules 3.00<" in svg
    assert ">total 7.00<" in svg


def test_a_month_of_days_names_at_most_fifteen_dates_the_last_among_them() -> None:
    svg = str(spend_chart(_data(("gpt", [1] * 90))))
    dates = re.findall(r'class="x-label"[^>]*>([^<]+)<', svg)
    assert 2 <= len(dates) <= 15
    assert dates[0] == (DAY + timedelta(days=89)).strftime("%b %d")  # drawn from today back


def test_labels_are_escaped() -> None:
    svg = str(spend_chart(_data(("<script>x</script>", [1]))))
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_no_spend_says_so() -> None:
    svg = str(spend_chart(_data()))
    assert "No spend in this period" in svg and ">total 0<" in svg


def test_the_budget_is_a_dashed_line_the_axis_reaches() -> None:
    svg = str(spend_chart(_data(("gpt", [1, 0, 3])), Decimal(5), "day budgets of 2 owners"))

    [line] = re.findall(r'<g class="budget-line">(.*?)</g>', svg)
    assert "stroke-dasharray" in line and ">day budgets of 2 owners 5.00<" in line
    amounts = re.findall(r'class="y-label"[^>]*>([^<]+)<', svg)
    assert amounts[-1] == "5"  # above the highest day (3), up to the budget
    y_budget = float(re.search(r'y1="([\d.]+)"', line).group(1))
    y_five = float(re.findall(r'y1="([\d.]+)" y2="[\d.]+" stroke="#ddd"', svg)[-1])
    assert abs(y_budget - y_five) < 0.2
    assert "budget-line" not in str(spend_chart(_data(("gpt", [1]))))  # none: no line
