"""Training campaigns over days: failures, checkpoints, restarts, ETTR (docs/campaign.md)."""
