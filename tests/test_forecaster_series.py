"""Bad series end in a one-line UserError (file, line, fix) or a documented repair, never NaN."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlalloc.env.errors import UserError
from rlalloc.forecaster.history import check_history
from rlalloc.forecaster.series import check_filled_share, load_demand_series


def write_series(path, minutes, active, total=100, time_format="%Y-%m-%d %H:%M:%S"):
    """A Philly-layout CSV (time,active,total) at the given minute offsets."""
    times = pd.Timestamp("2020-05-01") + pd.to_timedelta(np.asarray(minutes), unit="min")
    frame = pd.DataFrame(
        {"time": times.strftime(time_format), "active": active, "total": total}
    )
    frame.to_csv(path, index=False)
    return path


def test_helios_layout_demand_is_running_plus_pending_over_total(tmp_path):
    path = tmp_path / "vc.csv"
    pd.DataFrame({
        "time": ["2020-05-01 00:00:00", "2020-05-01 00:01:00"],
        "running_gpu_num": [10, 20], "pending_gpu_num": [6, 0], "total_gpu_num": [32, 32],
    }).to_csv(path, index=False)
    series = load_demand_series(path)
    np.testing.assert_allclose(series.segments[0].demand, [0.5, 0.625])


def test_short_gap_is_forward_filled_and_counted(tmp_path):
    minutes = [0, 1, 2, 5, 6]  # minutes 3 and 4 missing
    path = write_series(tmp_path / "s.csv", minutes, [10, 20, 30, 40, 50])
    series = load_demand_series(path, max_gap_min=2)
    np.testing.assert_allclose(series.segments[0].demand, [0.1, 0.2, 0.3, 0.3, 0.3, 0.4, 0.5])
    assert series.filled_minutes == 2


def test_more_than_a_tenth_forward_filled_is_refused_naming_the_series(tmp_path):
    one_filled = write_series(tmp_path / "ok.csv", [*range(5), *range(6, 11)], np.full(10, 5))
    assert check_filled_share(load_demand_series(one_filled)) == (
        f"{one_filled}: 1 of 11 minutes forward-filled (9.1%)")
    two_filled = write_series(tmp_path / "s.csv", [0, 1, 2, 5, 6], np.full(5, 5))
    with pytest.raises(UserError, match=r"s\.csv: 2 of 7 minutes \(29%\) would be forward-filled, "
                                        r"more than 10%.*resample the file to 1-minute samples"):
        check_filled_share(load_demand_series(two_filled))


def test_long_gap_splits_segments_and_short_ones_are_dropped(tmp_path):
    minutes = list(range(5)) + list(range(100, 120))
    path = write_series(tmp_path / "s.csv", minutes, np.arange(25))
    series = load_demand_series(path, max_gap_min=10, min_points=10)
    assert [len(s.demand) for s in series.segments] == [20]
    assert series.segments[0].start_minute_of_day == 100


def test_too_few_points_for_the_window(tmp_path):
    path = write_series(tmp_path / "s.csv", range(30), np.full(30, 5))
    with pytest.raises(UserError, match=r"s\.csv: longest gap-free run is 30 minutes.*1500"):
        load_demand_series(path, min_points=1500)


def test_duplicated_timestamp_names_the_line(tmp_path):
    path = write_series(tmp_path / "s.csv", [0, 1, 1, 2], [1, 2, 3, 4])
    with pytest.raises(UserError, match=r"s\.csv, line 4: .*repeats.*one row per minute"):
        load_demand_series(path)


def test_decreasing_timestamp_names_the_line(tmp_path):
    path = write_series(tmp_path / "s.csv", [0, 2, 1], [1, 2, 3])
    with pytest.raises(UserError, match=r"line 4: .*earlier.*sort the file"):
        load_demand_series(path)


@pytest.mark.parametrize("bad", ["abc", "", "nan"])
def test_non_numeric_or_empty_value_names_line_and_column(tmp_path, bad):
    path = tmp_path / "s.csv"
    path.write_text(
        "time,active,total\n2020-05-01 00:00:00,3,10\n2020-05-01 00:01:00," + bad + ",10\n"
    )
    with pytest.raises(UserError, match=r"s\.csv, line 3: column 'active'.*not a number"):
        load_demand_series(path)


def test_unparsable_time_and_unknown_columns_and_bad_total(tmp_path):
    bad_time = tmp_path / "t.csv"
    bad_time.write_text("time,active,total\nyesterday,3,10\n")
    with pytest.raises(UserError, match=r"t\.csv, line 2: time 'yesterday'"):
        load_demand_series(bad_time)
    unknown = tmp_path / "u.csv"
    unknown.write_text("time,gpus\n2020-05-01 00:00:00,3\n")
    with pytest.raises(UserError) as info:
        load_demand_series(unknown)
    message = str(info.value)
    assert "u.csv: header time,gpus matches no demand-series layout" in message
    for expected in ("time,running_gpu_num,pending_gpu_num,total_gpu_num", "time,active,total",
                     "time,demand", "docs/forecaster.md"):
        assert expected in message and "\n" not in message
    untimed = tmp_path / "n.csv"
    untimed.write_text("ts,demand\n2020-05-01 00:00:00,0.5\n")
    with pytest.raises(UserError, match=r"n\.csv: no 'time' column; name .* 'time' .*forecaster"):
        load_demand_series(untimed)
    zero_total = write_series(tmp_path / "z.csv", [0, 1], [1, 1], total=0)
    with pytest.raises(UserError, match=r"z\.csv, line 2: column 'total' is 0"):
        load_demand_series(zero_total)
    with pytest.raises(UserError, match="no such file"):
        load_demand_series(tmp_path / "missing.csv")


@pytest.mark.parametrize(("text", "line"), [
    ("time,demand\n\n\n2020-05-01 00:00:00,0.5\n2020-05-01 00:01:00,abc\n", 5),
    ('time,demand\n"2020-05-01\n00:00:00",0.5\n2020-05-01 00:01:00,abc\n', 4),
    ("\n \ntime,demand\r\n\r\n2020-05-01 00:00:00,0.5\r\n2020-05-01 00:01:00,abc\r\n", 6),
])
def test_line_numbers_count_blank_lines_and_cells_spanning_lines(tmp_path, text, line):
    path = tmp_path / "s.csv"
    path.write_bytes(text.encode())
    with pytest.raises(UserError, match=rf"s\.csv, line {line}: column 'demand' has 'abc'"):
        load_demand_series(path)


def test_blank_lines_anywhere_are_skipped(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("\ntime,demand\n\n2020-05-01 00:00:00,0.5\n \n2020-05-01 00:01:00,0.6\n\n")
    series = load_demand_series(path)
    np.testing.assert_allclose(series.segments[0].demand, [0.5, 0.6])


def test_unreadable_csv_error_is_one_line(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("time,demand\n2020-05-01 00:00:00,0.5\n2020-05-01 00:01:00,0.5,7\n")
    with pytest.raises(UserError) as info:
        load_demand_series(path)
    assert "Expected 2 fields in line 3, saw 3); pass a per-minute CSV" in str(info.value)
    assert "\n" not in str(info.value)


def test_header_only_file_is_a_user_error(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("time,running_gpu_num,pending_gpu_num,total_gpu_num\n")
    with pytest.raises(UserError, match=r"h\.csv: no data rows below the header.*at least 5"):
        load_demand_series(path, min_points=5)


def test_times_in_two_zones_name_the_first_line_that_differs(tmp_path):
    path = tmp_path / "tz.csv"
    path.write_text("time,demand\n2020-05-01 00:00:00,0.3\n2020-05-01 00:01:00,0.3\n"
                    "2020-05-01 00:02:00+00:00,0.3\n")
    with pytest.raises(UserError, match=r"tz\.csv, line 4: time '2020-05-01 00:02:00\+00:00' "
                                        r"\(UTC offset \+0000\).*line 2.*no UTC offset.*one zone"):
        load_demand_series(path)


def test_times_all_in_one_zone_are_accepted(tmp_path):
    path = tmp_path / "utc.csv"
    path.write_text("time,demand\n2020-05-01 00:00:00Z,0.3\n2020-05-01 00:01:00+00:00,0.4\n")
    np.testing.assert_allclose(load_demand_series(path).segments[0].demand, [0.3, 0.4])


@pytest.mark.parametrize(("header", "row", "column"), [
    ("time,demand", "-0.5", "demand"),
    ("time,active,total", "-3,10", "active"),
    ("time,running_gpu_num,pending_gpu_num,total_gpu_num", "4,-1,8", "pending_gpu_num"),
])
def test_negative_values_name_line_and_column(tmp_path, header, row, column):
    path = tmp_path / "n.csv"
    good = ",".join(["0"] * (header.count(",") - 1) + ["8"]) if "total" in header else "0.2"
    path.write_text(f"{header}\n2020-05-01 00:00:00,{good}\n2020-05-01 00:01:00,{row}\n")
    with pytest.raises(UserError, match=rf"n\.csv, line 3: column '{column}' is -.*negative"):
        load_demand_series(path)


def test_check_history_rejects_nan_short_and_2d():
    with pytest.raises(ValueError, match=r"history\[2\] is nan"):
        check_history(np.array([0.1, 0.2, np.nan, 0.3]), 2)
    with pytest.raises(ValueError, match="needs at least 10"):
        check_history(np.zeros(5), 10)
    with pytest.raises(ValueError, match="1-D"):
        check_history(np.zeros((5, 2)), 2)
