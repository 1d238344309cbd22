"""Transport security (TLS, SASL) and the credentials behind it."""
