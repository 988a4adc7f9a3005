"""
Tests for L{iop.cli}, the C{iop} operator command.
"""
