"""kvpool's version: the project() version of the top-level CMakeLists.txt."""

__version__ = "0.1.0"
