"""Host settings. Each provider module has `discover(host) -> list[Knob]`; `registry` joins them."""
