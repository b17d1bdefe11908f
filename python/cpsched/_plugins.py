"""The plugins the package finds."""
from __future__ import annotations

from . import _cpsched
from ._args import _folders


def plugins(plugin_paths=()):
    """The plugins found (the package's own, CPSCHED_PLUGIN_PATH and `plugin_paths`): name, kind, doc,
    file and parameters (name, type, default, doc) of each."""
    return _cpsched.plugins(_folders(plugin_paths, "plugin_paths"))


def plugin_problems(plugin_paths=()):
    """Why each plugin file that could not be loaded was rejected."""
    return _cpsched.plugin_problems(_folders(plugin_paths, "plugin_paths"))


def default_plugin_dir():
    """The folder the package's plugins are loaded from."""
    return _cpsched.default_plugin_dir()
