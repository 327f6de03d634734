"""The browser voice-call demo: static HTML, JS and CSS with no build step. A package only so
that its files ship in the wheel as package data; ``transports.server`` finds them here."""
