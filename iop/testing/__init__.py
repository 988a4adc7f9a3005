"""
Fakes and fixtures shared by tests, bench and the demo.
"""
