"""Who is asking, in the edge process (docs/security.md).

``api_keys`` (stream and admin key files), ``client_tokens`` (short-lived signed tokens a
browser holds), ``principal`` (what a request's credential grants: whom it charges, which
models, how much audio, from which origin), ``authenticator`` (a credential to a principal,
the one place every transport asks) and ``auth_failures`` (failed attempts slowed per address).
"""
