"""The console's own API asks for the token the services share (TRINITY_AUTH_TOKEN) when one is set: as a bearer
header (scripts) or the cookie `POST /api/login` sets (the page). The page itself and /health load without it, so
that the login form can show."""

from __future__ import annotations

import hmac

from fastapi import Request

COOKIE = "trinity_token"
OPEN_PATHS = ("/api/login", "/api/logout")


def presented_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    return request.cookies.get(COOKIE, "")


def token_matches(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def needs_token(path: str) -> bool:
    return path.startswith("/api/") and path not in OPEN_PATHS
