"""The Textual front end of dstui (the only place textual/plotext are imported)."""
