"""The request log as CSV: the admin changelist's rows (its filters, search and order, every page
of them), streamed a chunk at a time from a server-side cursor."""

import csv
from collections.abc import Iterator
from datetime import UTC, datetime

from asgiref.sync import sync_to_async
from django.contrib.admin.views.main import ChangeList
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from django.utils import timezone

from core.csvcells import csv_cell
from observability import requestlog


class QueryOnlyChangeList(ChangeList):
    """The changelist's rows (filters, search, order) without its page and count: for the export."""

    def get_results(self, request):
        self.result_count = self.full_result_count = None  # type: ignore[assignment]  # None: not counted
        self.result_list = self.queryset.none()
        self.can_show_all = self.multi_page = False


# The export's columns, (heading, value path): the table's as the writer fills them
# (observability.requestlog.COLUMNS), in its order, and beside an id the name a person reads.
_EXPORT_HEADINGS = {"at": "time"}
_EXPORT_NAMES = {"user_id": ("user", "user__username"), "api_key_id": ("api_key", "api_key__name")}


def _export_columns() -> list[tuple[str, str]]:
    columns = []
    for name, _ in requestlog.COLUMNS:
        columns.append((_EXPORT_HEADINGS.get(name, name), name))
        if name in _EXPORT_NAMES:
            columns.append(_EXPORT_NAMES[name])
    return columns


EXPORT_COLUMNS = _export_columns()
EXPORT_CHUNK_ROWS = 2000


class _Line:
    """A csv writer's file: hands back what it was given."""

    def write(self, value):
        return value


def _cell(value):
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return csv_cell(value)


def _csv_chunks(queryset) -> Iterator[str]:
    """The rows as CSV, a chunk of lines at a time, read through a server-side cursor: memory holds
    one chunk whatever the number of rows."""
    writer = csv.writer(_Line())
    lines = [writer.writerow([heading for heading, _ in EXPORT_COLUMNS])]
    rows = queryset.values_list(*[path for _, path in EXPORT_COLUMNS]).iterator(
        chunk_size=EXPORT_CHUNK_ROWS
    )
    for row in rows:
        lines.append(writer.writerow([_cell(value) for value in row]))
        if len(lines) >= EXPORT_CHUNK_ROWS:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


def _streamed(request, chunks: Iterator[str]):
    """What a StreamingHttpResponse streams under either server. Under ASGI Django reads a plain
    iterator to its end before it sends a byte; there, each chunk is read in the request's thread
    (where the cursor lives) and sent from the event loop."""
    if not isinstance(request, ASGIRequest):
        return chunks

    async def pull():
        try:
            read = sync_to_async(next, thread_sensitive=True)
            while (chunk := await read(chunks, None)) is not None:  # type: ignore[call-arg]  # next's default, passed on
                yield chunk
        finally:
            # A client gone mid-file: the cursor is closed now, not left open on a pooled
            # connection.
            await sync_to_async(chunks.close, thread_sensitive=True)()  # type: ignore[attr-defined]  # chunks is a generator

    return pull()


def export_response(request, queryset) -> StreamingHttpResponse:
    """`queryset`'s rows as a CSV attachment named by the time of the export."""
    response = StreamingHttpResponse(
        _streamed(request, _csv_chunks(queryset)),
        content_type="text/csv; charset=utf-8",
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="request-log-{stamp}.csv"'
    return response
