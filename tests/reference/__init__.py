"""Deliberately simple references for types no library decodes, kept apart from the vectorized codecs."""
