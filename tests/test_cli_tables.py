"""The CLI's tables (``app.cli.tables``) at any terminal width: an id is printed whole or not at all."""

from __future__ import annotations

import click
from click.testing import CliRunner

from app.cli.tables import Column, record, show

JOB = "afbb4f8a-38b2-4c1e-9f0a-1234567890ab"
ATTACHMENT = "5d2c4f8a-38b2-4c1e-9f0a-0987654321fe"
UPDATED = "2026-12-01T03:04:05.123456+00:00"
REASON = "the image claims to be a JPEG but its data ends before the last scan; re-upload it"
COLUMNS = [Column("job", whole=True), Column("attachment", whole=True, optional=True), Column("state"),
           Column("error"), Column("reason"), Column("updated", whole=True)]
ROW = [JOB, ATTACHMENT, "failed", "corrupt_image", REASON, UPDATED]


def printed(width: int, rows=(ROW,), columns=COLUMNS) -> str:
    @click.command()
    def command():
        show("jobs", columns, [list(r) for r in rows])

    result = CliRunner().invoke(command, [], env={"COLUMNS": str(width)}, catch_exceptions=False)
    assert result.exit_code == 0
    return result.output


def lines_with(output: str, value: str) -> list[str]:
    return [line for line in output.splitlines() if value in line]


def test_a_wide_terminal_gets_one_table_line_per_row_with_every_column():
    output = printed(240)
    [line] = lines_with(output, JOB)
    assert ATTACHMENT in line and UPDATED in line and REASON in line and "not shown" not in output


def test_text_folds_before_an_id_is_touched():
    output = printed(150)
    [line] = lines_with(output, JOB)
    assert ATTACHMENT in line and UPDATED in line, output
    assert REASON not in output and "the image" in line, "the reason folds onto more lines"
    assert max(len(line) for line in output.splitlines()) <= 150


def test_then_optional_columns_are_left_out_and_named():
    output = printed(110)
    [line] = lines_with(output, JOB)
    assert UPDATED in line and ATTACHMENT not in output
    assert "not shown at this width: attachment" in output


def test_a_narrow_terminal_gets_one_block_per_row_with_nothing_left_out():
    for width in (80, 60, 40):
        output = printed(width, rows=(ROW, [JOB[::-1], None, "queued", None, None, UPDATED]))
        for value in (JOB, ATTACHMENT, UPDATED, REASON, JOB[::-1]):
            assert len(lines_with(output, value)) >= 1, (width, value, output)
        assert lines_with(output, JOB)[0].split() == ["job", JOB]
        assert "not shown" not in output and "┃" not in output


def test_values_are_printed_as_they_are_not_as_markup():
    output = printed(240, rows=([JOB, ATTACHMENT, "[bold]failed[/]", None, "[red]x", UPDATED],))
    assert "[bold]failed[/]" in output and "[red]x" in output and " - " in output


def test_a_record_aligns_its_names():
    @click.command()
    def command():
        record([("job", JOB), ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"), ("error", None)])

    output = CliRunner().invoke(command, [], env={"COLUMNS": "40"}).output
    assert output.splitlines() == [f"job          {JOB}", "traceparent  00-" + "1" * 32 + "-" + "2" * 16 + "-01",
                                   "error        -"]
