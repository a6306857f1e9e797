"""The run report: build.py makes it (JSON) from the journal alone; view.py reads it, with the journal, into the
page's view, which svg.py draws, markdown.py puts in a table and html.py lays out as a self-contained page.
"""
