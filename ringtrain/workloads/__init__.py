"""Models, data and training flags shared by ring mode (ringtrain) and PS mode (ps_baseline)."""
