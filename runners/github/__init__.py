"""Talking to GitHub as a GitHub App (ARCH-10).

`client` is the production client (App JWT, installation tokens, the runner and job
endpoints), `auth` mints and caches the credentials it sends, `errors` is what it raises,
and `fake` is the in-process GitHub the tests and benchmarks run against. None of these
modules import Django: they take explicit parameters, and the settings registry is wired
to them elsewhere.
"""
