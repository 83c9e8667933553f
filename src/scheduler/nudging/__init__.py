"""The nudging path a live and a scheduled event share (REQ-0066): facts, rules, the engine, the orchestrator."""
