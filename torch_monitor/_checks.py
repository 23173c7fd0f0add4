"""Argument checks shared by the Python faces of the C++ objects."""


def strict_bool(value, name):
    """``value`` when it is a bool; a TypeError otherwise.

    ``bool('no')`` is True: a flag given as a string (or a number) would
    silently mean something else than the caller wrote.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value
