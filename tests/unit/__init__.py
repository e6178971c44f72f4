"""Unit tests: no server (fakeredis for Redis logic, scripted APIs for the watch loops)."""
