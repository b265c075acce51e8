"""Plotly figures and ipywidgets views built from traces."""
