"""Runtime pin guard tests: unit tests (fakes allowed) and the helpers the real SGLang tier uses."""
