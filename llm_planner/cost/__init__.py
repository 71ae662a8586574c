"""The one cost model: rooflines, measured tables and the files they come from."""
