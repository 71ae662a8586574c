"""Helix's files in and out, a model of its engine and a layout search for it."""
