"""Secrets in storage URLs: hidden before a URL is printed, stored or put in an error.

An Optuna storage URL may carry a password in its userinfo
(`postgresql://user:pw@host/db`) or in its query string (`?password=pw`).
`redact_url` is the one place that hides them: every error, summary line and
record that names a storage goes through it. It parses with SQLAlchemy's
`make_url`, the parser Optuna hands the URL to, so a password is found where
the database driver will find it, `/`, `:`, `?` and `%`-escapes included. What
cannot be parsed with certainty is hidden whole rather than guessed at.
`hide_secrets` scrubs a URL and its passwords out of other text, such as a
database driver's error message.
"""

from __future__ import annotations

import re
from urllib.parse import quote_plus, unquote, unquote_plus

HIDDEN = "***"
# Query parameters whose values are hidden: password, passwd, pwd, sslpassword,
# auth_token, secret, api_key, ... Hiding a harmless one (sslkey, a file name)
# costs nothing; printing a password is what must never happen.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|auth|cred", re.IGNORECASE)
_SCHEME = re.compile(r"[\w+]+")  # what `make_url` accepts before "://"


def redact_url(url: object) -> str:
    """The storage URL with every password replaced by `***`, fit to print or store.

    Args:
      url: an Optuna storage URL (anything else gives its type's name).

    Returns:
      The URL as SQLAlchemy renders it, the userinfo password and the values of
      password-like query parameters hidden. A URL with more than one `@`
      (an unescaped `@` in a password) hides everything before the last one;
      a string SQLAlchemy cannot parse shows at most its scheme.

    Example:
      >>> redact_url("postgresql://u:se/cr@t@db:5432/s?sslmode=require&password=x")
      'postgresql://***@db:5432/s?sslmode=require&password=***'
    """
    return _parse(url)[0]


def hide_secrets(text: str, url: object) -> str:
    """`text` with `url`, and every password in it, replaced by their hidden forms.

    For messages written by others (a database driver, SQLAlchemy) that may
    quote the URL or a piece of it, e.g. the host name a driver got from a
    password with an unescaped `@`.

    Example:
      >>> hide_secrets('could not connect as "u" with "pw"', "postgresql://u:pw@h/db")
      'could not connect as "u" with "***"'
    """
    if not isinstance(url, str) or not url:
        return text
    redacted, secrets = _parse(url)
    text = text.replace(url, redacted)
    # Longest first, so a password is hidden whole before any piece of it.
    for secret in sorted(secrets, key=lambda s: (-len(s), s)):
        text = text.replace(secret, HIDDEN)
    return text


def _parse(url: object) -> tuple[str, list[str]]:
    """(the redacted URL, the secrets it holds: raw and decoded forms)."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>", []
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return _unparsed(url)
    secrets: list[str] = []
    prefix = ""
    if rest.count("@") > 1:
        # `make_url` splits at the first `@` and hands the driver the rest of
        # the password as part of the host (or database) name; take the
        # userinfo to run to the last `@`, and hide those names in messages too.
        userinfo, _, rest = rest.rpartition("@")
        secrets += [userinfo.partition(":")[2] or userinfo.partition("@")[2],
                    *_misread_parts(url)]
        prefix = f"{HIDDEN}@"
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(f"{scheme}://{rest}")
        query = parsed.query
        rendered = parsed.set(query={}).render_as_string(hide_password=True)
    except Exception:  # ArgumentError, a bad port's ValueError, ...
        return _unparsed(url)
    if parsed.password is not None:
        raw = re.match(r"[^:/]*:([^@]*)@", rest)
        secrets += [parsed.password, raw.group(1) if raw else ""]
    pairs = []
    # The query as written: after the userinfo (as `make_url` reads it), if any.
    userinfo = re.match(r"[^:/]*(?::[^@]*)?@", rest)
    raw_query = rest[userinfo.end() if userinfo else 0:].partition("?")[2]
    for key, values in query.items():
        hide = bool(_SECRET_KEY.search(key))
        for value in (values,) if isinstance(values, str) else values:
            pairs.append(f"{quote_plus(key)}={HIDDEN if hide else quote_plus(value)}")
            if hide:
                secrets.append(value)
    for item in raw_query.split("&"):
        key, _, value = item.partition("=")
        if _SECRET_KEY.search(unquote_plus(key)):
            secrets += [value, unquote_plus(value)]
    if not secrets:
        return url, []  # nothing to hide: the URL as the user wrote it
    if prefix:
        rendered = rendered.replace("://", f"://{prefix}", 1)
    if pairs:
        rendered += "?" + "&".join(pairs)
    secrets += [quote_plus(s) for s in secrets] + [unquote(s) for s in secrets]
    return rendered, [s for s in dict.fromkeys(secrets) if s]


def _misread_parts(url: str) -> list[str]:
    """The names `make_url` misreads out of a URL whose password holds a raw `@`."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return []
    # Drivers print host and database names in their errors, never the password.
    return [p for p in (parsed.host, parsed.database) if p and "@" in p]


def _unparsed(url: str) -> tuple[str, list[str]]:
    # Not a URL SQLAlchemy reads the same way each time: keep only a scheme.
    scheme = re.match(r"[A-Za-z][\w+.-]*:", url)
    head = scheme.group(0) if scheme else ""
    return head + HIDDEN, [url[len(head):]] if url[len(head):] else []
