"""Why a child failed, in one short line: ``oarbank_sdk.logtail`` (shared with ``conform``, so
both say the same line)."""

from __future__ import annotations

from oarbank_sdk.logtail import SUMMARY_CHARS, TAIL_BYTES, read_tail, summary, with_summary

__all__ = ["TAIL_BYTES", "SUMMARY_CHARS", "read_tail", "summary", "with_summary"]
