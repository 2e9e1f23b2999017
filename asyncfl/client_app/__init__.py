"""ClientApp: local training and evaluation on the node's partition."""
