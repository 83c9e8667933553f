"""The dispatch core: storing a row, the claim, the loop that dispatches due rows (REQ-0064..0067)."""
