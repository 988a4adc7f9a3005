"""System tests: real twistd processes, real sockets, real TLS."""
