"""lockserver: a standalone in-memory lock server in the style of Azos Sky locking."""
