"""The results page from committed data (issue 27): docs/data/<section>/results.json -> docs/results.md.

- :mod:`.data`: the file format and :func:`~.data.write_section_data`, which every benchmark calls;
- :mod:`.sections`: the sections in page order (how to add one: its docstring);
- :mod:`.template`: docs/notes/<section>.md prose with figures filled in from the data;
- :mod:`.summary`: one table of where each method wins and loses, from the claims sections declare;
- :mod:`.stats`: Wilson intervals; :mod:`.page`: the page and README's headline table.
"""
