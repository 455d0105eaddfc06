"""The length-generalization study: its plan and job graph (``plan``), parallel jobs
(``jobs``), statistics (``stats``), report (``report``) and figures (``figures``)."""
