"""What every variant shares: the config, masks, input checks, canonical weights."""
