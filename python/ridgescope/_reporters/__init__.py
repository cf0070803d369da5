"""The reporters: what turns a report's data (``Report.to_dict()``, docs/report_schema.md) into
what people read. Each module renders; none analyses, and none is imported by the layers below
(``_report``, ``_session``, ``distributed`` import a reporter only inside the method that renders).

    _text.py, _snapshot_text.py, _distributed_text.py   the text report (``Report.summary()``)
    _html.py, _html_assets/                            the HTML page (``Report.to_html()``)
    _ranks_text.py, _ranks_html.py                     the merged multi-rank report
    _tensorboard.py                                    TensorBoard scalars
    _notebook.py                                       a notebook's display (``_repr_html_``)
"""
