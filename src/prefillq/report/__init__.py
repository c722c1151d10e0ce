"""Turning records and summaries into tables (rich), CSV/JSON files and PNG plots."""

from prefillq.report.tables import (
    COMPARE_COLUMNS,
    compare_json,
    compare_table,
    write_json,
    write_records_csv,
    write_summary_csv,
)

__all__ = ["COMPARE_COLUMNS", "compare_json", "compare_table", "write_json",
           "write_records_csv", "write_summary_csv"]
