"""
Tests for L{iop.security}.
"""
