"""Every terminal rendering: tables, progress, the fleet view, the leaderboard, compare/parity/inspect views."""
