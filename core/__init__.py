"""Below every layer: what agent/, tools/, db/ and bot/ all need and none of them owns."""
