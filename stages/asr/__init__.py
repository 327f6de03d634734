"""Speech recognition: the backend interface, the streaming stage and the model backends."""
