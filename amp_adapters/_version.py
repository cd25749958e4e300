"""The package's version, in the one place: ``amp_adapters.__version__``, the command's
``--version`` and setup.cfg (``version = attr: amp_adapters._version.__version__``) read it.
A module of its own so that the command's floor (``services``) need not import the package
above it."""
__version__ = "0.2.0"
