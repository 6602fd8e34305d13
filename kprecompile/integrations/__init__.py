"""Engine integrations: each maps an engine's own config onto the loader hook."""
