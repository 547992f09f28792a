"""The shipped tasks, one folder each with everything of the task together: ``expr24``,
``smiles``, ``commongen``, ``amp``, ``custom`` (a user's reward). In every folder ``task`` is the
task (a :class:`raptb.core.ports.Task`) and ``spec`` its registry entry, the ``TaskSpec``
(``registry``) ``SPEC`` that raptb's ``setup.py`` declares, for each folder with a ``spec.py``,
as a ``raptb.tasks`` entry point, as a plug-in package would; their data files sit in its
``files/`` with their provenance and licence. Beside the folders: the registry (``registry``),
the plug-in loader (``plugins``), the SubM presets the tasks share (``subm_presets``),
``module:function`` paths (``dotted_path``) and the shipped data files' reader
(``shipped_data``)."""
