"""
Tests for L{iop.logs}.
"""
