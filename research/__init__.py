"""Research tools outside the installed package: KVP scorer training (kvp/), MSVE weight calibration (msve/)."""
