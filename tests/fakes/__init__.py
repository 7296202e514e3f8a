"""Fakes for tests: real servers and scripted models standing in for the outside world."""
