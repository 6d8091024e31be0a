"""For tests of the product running in processes of their own: the folder to start them in, a
database URL naming another database (the test run's), and a GET that returns whatever status
the server answers."""

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parents[2]


def http_get(url: str, timeout: float = 10, cookie: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, an HTTP error status included, for tests of a server in a
    process."""
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def url_with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()
