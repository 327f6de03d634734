"""SIP for telephone calls: a sans-I/O message parser/serializer, SDP offer/answer, the sans-I/O
user agent server (dialogs and transactions) and its asyncio UDP shell."""
