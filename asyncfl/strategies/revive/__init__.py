"""FedRevive's data-free KD machinery (KD-Revive): generator, teacher proxies, synthesis, KD pool."""
