"""Paged, filtered and sorted lists for the admin API (queues, topics, connections, sessions).

A broker may hold 10,000 queues or 100,000 connections: a list answer is one
page (``?page=1&page_size=100``, at most 1000 items), after a substring
``?filter=`` and a ``?sort=`` by one field (``-field`` for descending).
Filtering and sorting look at cheap keys of every item; only the items of
the page are described in full, so a page costs O(items) cheap work plus
O(page size) descriptions.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from twisted.web import server

from gateway.admin.http import HttpError, int_query, query

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_FILTER = 1000


@dataclass(frozen=True)
class Page:
    number: int
    size: int
    filter: str
    sort: str
    descending: bool


def page_request(request: server.Request, sorts: Iterable[str], default_sort: str) -> Page:
    """The page, filter and sort a request asks for; 400 naming the parameter when one is bad."""
    number = int_query(request, "page", 1, low=1, high=10_000_000)
    size = int_query(request, "page_size", DEFAULT_PAGE_SIZE, low=1, high=MAX_PAGE_SIZE)
    text = query(request, "filter") or ""
    if len(text) > MAX_FILTER:
        raise HttpError(400, f"parameter filter is longer than {MAX_FILTER} characters")
    sort = query(request, "sort") or default_sort
    descending = sort.startswith("-")
    field = sort[1:] if descending else sort
    known = list(sorts)
    if field not in known:
        raise HttpError(400, f"parameter sort must be one of {', '.join(known)} (with a leading - for descending), got {sort[:40]!r}")
    return Page(number, size, text, field, descending)


def paged(
    page: Page, items: Iterable[T], *, text: Callable[[T], str], sorts: Mapping[str, Callable[[T], Any]],
    describe: Callable[[T], dict[str, Any]], name: str,
) -> dict[str, Any]:
    """One page of ``items``: filtered by ``text`` (case-insensitive substring), sorted, then described.

    Sort keys must be comparable among themselves; ties keep the items' own order.
    """
    chosen = list(items)
    if page.filter:
        needle = page.filter.lower()
        chosen = [item for item in chosen if needle in text(item).lower()]
    key = sorts[page.sort]
    chosen.sort(key=key, reverse=page.descending)
    total = len(chosen)
    start = (page.number - 1) * page.size
    return {
        name: [describe(item) for item in chosen[start:start + page.size]],
        "total": total,
        "page": page.number,
        "page_size": page.size,
        "pages": (total + page.size - 1) // page.size,
    }
