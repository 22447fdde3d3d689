"""Backend 'aot': registered by its own issue; this module is a placeholder until then."""
