"""The run report: build.py makes it (JSON) from the journal alone; the page and the Markdown summary are drawn from
it (html.py).
"""
