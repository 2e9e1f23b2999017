"""ServerApp entry and the async engine (the only code that touches Grid)."""
