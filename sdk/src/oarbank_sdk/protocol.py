"""The endpoint protocol's parts for whoever speaks it from the agent's side (contract section 3).

The node agent and tools import these rather than the SDK's private modules:

- ``wire``: the line codec and the messages (``encode``, ``decode``, ``LineSplitter``,
  ``MAX_LINE``, ``Connect``, ``Ok``, ``Refusal``, ``Hello``, ``Connection``, ``Accepted``,
  ``Ready``, ``Received``, ``Ended``, ``parse_from_job``, ``parse_from_service``, ``WireError``).
- ``current_transport()``: the one seam between the protocol and the operating system: stream
  pairs (``pair``), handle values for a child's environment (``format``/``parse``), the
  arguments that hand handles to a child (``inheritable_kwargs``), descriptor passing
  (``send``/``recv``; ``MAX_HANDLES`` travel in one message at most). No other code makes
  socket pairs or spells ``fd:<n>``.
- ``last_json_object``: what an op printed (the last line of its output that is a JSON object).
- Windows' pipes, for an agent there (``handle:<n>``): ``PipeStream``, the synchronous stream a
  child holds, and ``connected_pipe``, the handles of a new duplex pipe nobody can open by
  name (the agent makes its own end overlapped), ``duplicate_into`` / ``close_in``: a copy of
  one of our handles put into (or taken back out of) another process. They import everywhere,
  work on Windows.

Standard library only, like the rest of the service side.
"""

from __future__ import annotations

from . import _wire as wire
from ._opdoc import last_json_object
from ._transport import MAX_HANDLES, Transport, UnsupportedHandle
from ._transport import current as current_transport
from ._winpipe import PipeStream, close_in, connected_pipe, duplicate_into

__all__ = ["wire", "MAX_HANDLES", "Transport", "UnsupportedHandle", "current_transport",
           "last_json_object", "PipeStream", "connected_pipe", "duplicate_into", "close_in"]
