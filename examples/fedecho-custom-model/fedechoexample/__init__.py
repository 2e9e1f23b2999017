"""fedechoexample: FedEcho on a user-defined model, through asyncfl's public API."""
