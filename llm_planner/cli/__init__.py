"""The command line: parses arguments, calls the layers, prints."""
